"""`python -m shardkit.cli`: the shardkit command."""

from shardkit.cli import main

main()
