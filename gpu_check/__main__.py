import sys

from gpu_check.check import main

sys.exit(main())
