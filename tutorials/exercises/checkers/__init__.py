"""One checker per exercise (``NN_slug.py``, loaded by :func:`tutorials.exercises.harness.checker`):
its ``TITLE``, its ``PARTS`` and, for most, a ``score``.  :mod:`.common` holds what they share."""
