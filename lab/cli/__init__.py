"""The command line: argv -> calls into the layers below; the only layer that prints or exits (errors map to exit codes in lab.cli.main)."""
