"""python -m keel_lab ... == keel ..."""
import sys

from .cli import main

sys.exit(main())
