"""Research probes of the repository, run from a checkout (``python -m research.<probe>``).

Not installed (setup.py leaves this folder out): these modules may import ``act_ros``, and
no module of ``act_ros`` imports them (test/test_core_imports.py checks it).
"""
