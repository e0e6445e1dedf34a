"""Offline feature cache: run the target once (``draftsmith cache``), train many epochs from disk.

``store.py`` is the on-disk format (no engine imports); ``build.py`` runs an engine over the trainer's
rows and writes shards; ``draftsmith.targets.cache`` serves a cache as the ``cache`` engine.
"""
