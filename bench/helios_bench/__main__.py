"""python3 -m helios_bench (with bench/ on PYTHONPATH): the helios-bench command line."""
import sys

from .cli import main

sys.exit(main())
