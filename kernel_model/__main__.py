import sys

from kernel_model.report import main

sys.exit(main())
