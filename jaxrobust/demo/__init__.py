"""The demos that ``jaxrobust demo`` runs (its options: :mod:`jaxrobust.cli.demo`): the digits'
data, model, training and driver (:mod:`jaxrobust.demo.digits`: the tables and the report), and,
with ``--text``, the synthetic text demo (``text_*.py``)."""
