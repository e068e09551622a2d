"""The evaluation layer: commands that score the components on the digital twin. It runs no process
of the stack; it only adds `fleetsight evaluate`. Nothing in the components imports it."""

CLI = {"evaluate": (".cli", "score alerts, stragglers, panels and health on the twin; its history as blocks")}
