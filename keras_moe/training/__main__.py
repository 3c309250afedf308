"""`python -m keras_moe.training` is `keras-moe-train`."""

from keras_moe.training.train_cli import main

if __name__ == "__main__":
    raise SystemExit(main())
