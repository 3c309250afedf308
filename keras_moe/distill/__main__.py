"""`python -m keras_moe.distill`: see `keras_moe.distill.cli`."""

import sys

from keras_moe.distill.cli import main

sys.exit(main())
