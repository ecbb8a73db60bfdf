"""The ``ckview`` command: one module per verb; heavy imports happen inside each verb."""
