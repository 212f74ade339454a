"""Instance level on [CLS]: revisited Oxford / Paris image retrieval and Copydays copy detection (DINO)."""
