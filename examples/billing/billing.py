"""A tiny billing module that keeps money in floats (and gets cents wrong)."""


def total(prices: list[float]) -> float:
    """The sum of the prices, in euros."""
    return sum(prices)


def apply_discount(amount: float, percent: float) -> float:
    """The amount after a discount, rounded to the cent (half up)."""
    return amount * (100 - percent) / 100


def split(amount: float, parts: int) -> list[float]:
    """Split an amount into parts that add up to it exactly (first parts take extra cents)."""
    return [amount / parts] * parts
