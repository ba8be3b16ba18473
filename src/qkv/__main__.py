"""``python -m qkv``: the ``qkv`` command line (``qkv.cli``)."""

from .cli import main

if __name__ == "__main__":
    main()
