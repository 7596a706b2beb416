"""argparse types shared by the commands: a bad value is a one-line usage error."""
import argparse

__all__ = ["positive_int", "port_number"]


def positive_int(text):
    """An int >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def port_number(text):
    """A TCP port, 0..65535 (0: any free port)."""
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number in 0..65535, got {value}")
    return value
