"""The course: ten tutorials (``tutorials/0*.py``, ``1*.py``) and the exercises (:mod:`tutorials.exercises`).

Installed with refconv by ``make setup`` (an editable install of this checkout), so
``from tutorials.exercises import check`` and ``python -m tutorials.exercises`` work from any
folder, with the venv's python or a Jupyter kernel of it.  The tutorials themselves import
``course`` from this folder; it is also :mod:`tutorials.course`.
"""
