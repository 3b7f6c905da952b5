"""The click commands (``dfmp2 run``, ``gradient``, ``optimize``, ``interaction``, ``compare``,
``regress``, ``bench``): options and runtime, no science."""
