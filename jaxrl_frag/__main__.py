import sys

from jaxrl_frag.cli import main

sys.exit(main())
