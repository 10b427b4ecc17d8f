"""Fix 2: do the arithmetic in Decimal cents, rounding half up, spreading the remainder."""

from decimal import ROUND_HALF_UP, Decimal

CENT = Decimal("0.01")


def _d(value: float) -> Decimal:
    return Decimal(str(value))


def total(prices: list[float]) -> float:
    return float(sum((_d(p) for p in prices), Decimal(0)))


def apply_discount(amount: float, percent: float) -> float:
    discounted = _d(amount) * (100 - _d(percent)) / 100
    return float(discounted.quantize(CENT, rounding=ROUND_HALF_UP))


def split(amount: float, parts: int) -> list[float]:
    cents = int((_d(amount) / CENT).to_integral_value())
    base, extra = divmod(cents, parts)
    return [float((base + (1 if i < extra else 0)) * CENT) for i in range(parts)]
