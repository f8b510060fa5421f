"""Drop-in compatibility with the DashScope SDK: the import finder that serves the SDK's
module paths (sdk) and the modules behind them (alias)."""
