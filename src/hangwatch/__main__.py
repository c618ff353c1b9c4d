"""``python -m hangwatch`` is the same as the ``hangwatch`` console script."""

from hangwatch.cli import console_main

if __name__ == "__main__":
    console_main()
