"""One module per `mtmc` subcommand, each with register(subparsers), and the dispatcher
cli.py that registers them.  Nothing imports this package but the benchmarks, which run the
command line as a user does: what several commands share lives below it (agents.context)."""
