"""``python -m hargo.gpu_check`` (:func:`hargo.gpu_check.cli.main`)."""
import sys

from hargo.gpu_check.cli import main

sys.exit(main())
