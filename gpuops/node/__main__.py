import sys

from gpuops.node.main import main

sys.exit(main())
