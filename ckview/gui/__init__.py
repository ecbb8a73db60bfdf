"""The desktop explorer (PyQt6 + pyqtgraph) and the exported report figure.

The widgets (``timeline``, ``plan_panel``, ``inspector``, ``compare``, ``main_window``) and
``report`` draw what the Qt-free application model in ``ckview.app`` computes. ``display``
(stdlib only) checks whether a window can open before Qt is imported. Nothing here imports
torch.
"""
