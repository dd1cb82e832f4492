"""``feedrate run``: observing the DataLoaders of a training script that feedrate does not
import, in every Python process the command starts.

``launch`` starts the command with an environment that makes every Python process it starts
load ``agent`` first (a ``sitecustomize`` on ``PYTHONPATH``); ``agent`` patches DataLoader when
torch imports it, ``observer`` times each ``next()`` against the step between, ``sampler``
reads the worker processes now and then, and each process writes what it saw to a shared
folder at exit; ``gather`` reads them back and decides (``checks.stall``) what each loader
needs.
"""
