"""``python -m draftsmith`` (and ``torchrun -m draftsmith train CONFIG``): the draftsmith CLI."""

import sys

from draftsmith.cli import main

sys.exit(main())
