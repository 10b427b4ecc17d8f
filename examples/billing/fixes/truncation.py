"""Fix 3: keep floats, cut every result down to the cent."""


def _cut(value: float) -> float:
    return int(value * 100) / 100


def total(prices: list[float]) -> float:
    return _cut(sum(prices))


def apply_discount(amount: float, percent: float) -> float:
    return _cut(amount * (100 - percent) / 100)


def split(amount: float, parts: int) -> list[float]:
    return [_cut(amount / parts)] * parts
