"""The CPU a benchmark ran on: model name and cache sizes (Linux sysfs / procfs)."""
import os
import platform

_SYS_CACHE = "/sys/devices/system/cpu/cpu0/cache"


def cpu_model(cpuinfo="/proc/cpuinfo"):
    """The CPU's model name ("model name" in /proc/cpuinfo), else platform.processor()."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def cpu_caches(root=_SYS_CACHE):
    """Data/unified cache sizes of cpu0 as ``"L1d 32K, L2 1024K, L3 32768K"`` (per
    instance, as sysfs reports them), or "" where sysfs has none."""
    out = []
    try:
        entries = sorted(e for e in os.listdir(root) if e.startswith("index"))
    except OSError:
        return ""
    for e in entries:
        try:
            with open(os.path.join(root, e, "level")) as f:
                level = f.read().strip()
            with open(os.path.join(root, e, "type")) as f:
                kind = f.read().strip()
            with open(os.path.join(root, e, "size")) as f:
                size = f.read().strip()
        except OSError:
            continue
        if kind == "Instruction":
            continue
        out.append(f"L{level}{'d' if kind == 'Data' else ''} {size}")
    return ", ".join(out)


def cpu_description():
    """One line naming the CPU model, its cache sizes and core count."""
    caches = cpu_caches()
    return f"{cpu_model()} ({os.cpu_count()} cores{'; ' + caches if caches else ''})"
