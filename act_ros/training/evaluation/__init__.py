"""Closed-loop evaluation: a policy in the simulation through the node's own control loop.

``rollout`` (the in-process policy and episode runner), ``evaluate`` (``act-ros
evaluate``: success rates over seeds, with the seams of every episode), ``video``
(episode videos) and ``seam_plot`` (``act-ros plot-seams``). The trainer's periodic
evaluation and the drivers build on it (docs/architecture.md, section 1).
"""
