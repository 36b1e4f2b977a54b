"""`python -m shardkit.demo OUT` (see shardkit.demo)."""

import sys

from shardkit.demo import main

if __name__ == "__main__":  # loader workers that spawn import this module again
    sys.exit(main(sys.argv[1:]))
