import sys

from control_node.cli import main

sys.exit(main())
