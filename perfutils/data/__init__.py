"""The data room: what a recorded file is, beneath the harness that writes it and the figures that read it.

``schema`` (columns, keys, statuses, where a file lives), ``records`` (reading and validating a CSV and its JSON
sidecar), ``store`` (atomic, resumable writing), ``metadata`` (the sidecar: GPU, clocks, versions, git state).
"""
