"""The console's object pages, one module per family: models and versions, devices."""
