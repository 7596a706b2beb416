"""Tools apart from the library: the command line (``python -m pagedcy``), the benchmark,
the demo and the build report (``show_config``)."""
