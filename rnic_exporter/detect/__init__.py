"""Detection: snapshots, addresses, the persisted inventory and expectations in; conditions, events out.

`conditions.py` judges one moment (pure), `diff.py` turns two judgments into events (pure),
`problems.py` explains one judgment for `check`, `detector.py` carries the state between polls.
"""
