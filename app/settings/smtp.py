"""The one 'ready' e-mail: the SMTP server it leaves through, and how many may leave an hour."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, SecretStr, model_validator

from app.settings.base import Group
from jail.addresses import is_loopback_host

if TYPE_CHECKING:
    from pool.mailer import SmtpOptions


class SmtpSettings(Group):
    host: str | None = Field(
        default=None,
        alias="smtp_host",
        description="SMTP server for the one 'ready' e-mail; unset: no e-mail.",
    )
    port: int = Field(default=587, ge=1, le=65535, alias="smtp_port", description="SMTP port.")
    security: Literal["starttls", "tls", "none"] = Field(
        default="starttls",
        alias="smtp_security",
        description="`starttls`, `tls` (implicit) or `none` (loopback only).",
    )
    user: str | None = Field(default=None, alias="smtp_user", description="SMTP user name, if any.")
    password: SecretStr | None = Field(
        default=None, alias="smtp_password", description="SMTP password, if any."
    )
    sender: str = Field(
        default="sandbox-mcp@localhost",
        alias="smtp_sender",
        description="The From address of the 'ready' e-mail.",
    )
    max_per_hour: int = Field(
        default=60,
        ge=0,
        le=10_000,
        alias="smtp_max_per_hour",
        description="At most this many e-mails leave in any hour.",
    )

    @model_validator(mode="after")
    def _plain_text_only_on_loopback(self) -> SmtpSettings:
        if self.security == "none" and self.host and not is_loopback_host(self.host):
            raise ValueError(
                "SANDBOX_MCP_SMTP_SECURITY='none' is allowed only for a loopback SMTP_HOST: "
                "the message and the password would cross the network in clear"
            )
        return self

    def options(self) -> SmtpOptions | None:
        """How the mailer reaches the SMTP server; None: no e-mail is sent."""
        if not self.host:
            return None
        from pool.mailer import SmtpOptions  # the mail client only when serving

        return SmtpOptions(
            host=self.host,
            port=self.port,
            security=self.security,
            sender=self.sender,
            username=self.user,
            password=self.password.get_secret_value() if self.password else None,
        )
