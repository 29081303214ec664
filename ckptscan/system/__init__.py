"""What touches the operating system: atomic writes, paths, interrupts, threads, output files."""
