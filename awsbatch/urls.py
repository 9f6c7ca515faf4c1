"""The AWS Batch API, under /aws/ (boto3's endpoint_url is https://PORTAL/aws)."""

from django.urls import path

from awsbatch import views

app_name = "awsbatch"

urlpatterns = [path("v1/<str:path>", views.operation, name="operation")]
