"""One module per `mtmc` subcommand, each with register(subparsers).  Nothing imports this
package but mtmc.cli: what several commands share lives below it (agents.context)."""
