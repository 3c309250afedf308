"""`python -m keras_moe.distill`: see `keras_moe.distill.distill_cli`."""

import sys

from keras_moe.distill.distill_cli import main

sys.exit(main())
