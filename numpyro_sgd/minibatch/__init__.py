"""How minibatch rows are drawn: the registry of minibatch laws (``law.py``), one file per law
(``with_replacement.py``, ``without_replacement.py``, ``shuffle.py``) and the policy that picks S
and the cluster size from the data (``policy.py``).
"""
