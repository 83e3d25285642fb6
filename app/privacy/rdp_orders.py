"""The Renyi orders every RDP curve of a silo's ledger is computed at (app/privacy/accounting.py,
app/privacy/skellam/accounting.py): dense where the optimum usually lies, integers only (the
without-replacement bounds of WBK19 are stated at integer orders). No imports: both accountants
read it without importing each other."""

RDP_ORDERS: tuple[float, ...] = tuple(range(2, 65)) + (80, 96, 128, 192, 256)
