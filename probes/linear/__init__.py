"""Classification on [CLS]: the linear probe (DINO eval_linear) and k-NN (DINO eval_knn)."""
