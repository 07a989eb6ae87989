"""``python -m verispec``: the ``verispec`` command (for an interpreter whose scripts folder is not on PATH)."""

from verispec.cli.main import main

main()
