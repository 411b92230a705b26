"""Forward FLOPs to the first token of a long video at each EVS rate (docs/token_reduction.md): the count is
vl/bench/evs_flops.py; this runs it.

Usage: .venv/bin/python scripts/research/evs_flops.py [--model DIR] [--frames 64] [--rates 0,0.5,0.75,0.9] [--text-tokens 961]
"""

from vl.bench.evs_flops import main

if __name__ == "__main__":
    main()
