"""The studies: one module per question a notebook answers, measuring through the harness (:mod:`perfutils.measure`)
into the data room (:mod:`perfutils.data`), each with its command line (``python -m perfutils <study> --help``;
:data:`perfutils.cli.STUDIES`). docs/architecture.md says which notebook reads which."""
