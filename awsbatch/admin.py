from __future__ import annotations

from django.contrib import admin, messages
from django.http import HttpRequest

from awsbatch.keys import access_key_create, access_key_revoke
from awsbatch.models import AccessKey, InstanceType

SECRET_SHOWN_ONCE = (
    "Access key {key_id} for {user}. Its secret, shown this once: {secret} — "
    "export AWS_ACCESS_KEY_ID={key_id} AWS_SECRET_ACCESS_KEY={secret}"
)


@admin.register(AccessKey)
class AccessKeyAdmin(admin.ModelAdmin):
    """Keys are created here (the secret shown once, in a message) and revoked; the secret is
    never shown again."""

    list_display = ["access_key_id", "user", "description", "created_at", "last_used_at",
                    "revoked_at"]  # fmt: skip
    list_filter = ["revoked_at"]
    search_fields = ["access_key_id", "user__username", "description"]
    fields = ["user", "description", "access_key_id", "created_at", "last_used_at", "revoked_at"]
    readonly_fields = ["access_key_id", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def get_readonly_fields(self, request: HttpRequest, obj=None):
        return [*self.readonly_fields, "user"] if obj is not None else self.readonly_fields

    def save_model(self, request: HttpRequest, obj: AccessKey, form, change: bool) -> None:
        if change:
            obj.save(update_fields=["description"])
            return
        new = access_key_create(user=obj.user, description=obj.description)
        obj.pk, obj.access_key_id = new.key.pk, new.key.access_key_id
        self.message_user(
            request,
            SECRET_SHOWN_ONCE.format(
                key_id=new.key.access_key_id, user=obj.user, secret=new.secret
            ),  # fmt: skip
            messages.WARNING,
        )

    @admin.action(description="Revoke: requests signed with these keys are refused")
    def revoke(self, request: HttpRequest, queryset) -> None:
        for key in queryset:
            access_key_revoke(key=key)


@admin.register(InstanceType)
class InstanceTypeAdmin(admin.ModelAdmin):
    """The instance types a SageMaker request or a share's capacity limit may name."""

    list_display = ["name", "gpu_type", "gpus"]
    search_fields = ["name", "gpu_type"]
