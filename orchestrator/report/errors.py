"""The one error a report raises: a stored record it cannot render, naming the run and the field."""


class ReportError(ValueError):
    pass
