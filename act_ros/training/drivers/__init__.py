"""Drivers that put a trained policy in the loop: ``collect`` (``act-ros collect``,
expert or DAgger demonstrations), ``dagger`` (corrections by the scripted expert),
``dagger_loop`` (``act-ros dagger``: collect, train, evaluate, repeat) and ``recipe``
(``act-ros recipe``: a whole run as one resumable command). They sit above the trainer
and the evaluation (docs/architecture.md, section 1).
"""
