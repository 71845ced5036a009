"""``python -m act_ros.ros.sim_bridge``: run the bridge (the ``sim_bridge`` console script)."""

import sys

from act_ros.ros.sim_bridge.bridge import main

sys.exit(main())
