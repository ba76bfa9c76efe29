import sys

from delegate_executor import main

sys.exit(main())
