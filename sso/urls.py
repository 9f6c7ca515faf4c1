from django.urls import path

from sso import views

app_name = "sso"

urlpatterns = [
    path("login/", views.LoginStart.as_view(), name="login"),
    path("callback/", views.LoginCallback.as_view(), name="callback"),
]
