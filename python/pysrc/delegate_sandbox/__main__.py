import sys

from delegate_sandbox import main

sys.exit(main())
