"""Fix 1: keep floats, round every result to the cent."""


def total(prices: list[float]) -> float:
    return round(sum(prices), 2)


def apply_discount(amount: float, percent: float) -> float:
    return round(amount * (100 - percent) / 100, 2)


def split(amount: float, parts: int) -> list[float]:
    return [round(amount / parts, 2)] * parts
