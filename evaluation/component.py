"""The evaluation layer: commands that score the components on the digital twin. It runs no process
of the stack; it only adds `fleetsight evaluate` and `fleetsight gameday`. Nothing in the components
imports it."""

CLI = {
    "evaluate": (".cli", "score alerts, stragglers, panels and health on the twin; its history as blocks"),
    "gameday": (
        ".cli_gameday",
        "break FleetSight's own processes while the twin has faults; judge the damage",
    ),
}
