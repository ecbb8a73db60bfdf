"""The desktop explorer (PyQt6 + pyqtgraph) and the exported report.

``rundata``, ``planning``, ``envelope``, ``style`` and ``display`` import no Qt: they compute
what the widgets (``timeline``, ``plan_panel``, ``inspector``, ``compare``, ``main_window``) and
``report`` draw. Nothing here imports torch.
"""
