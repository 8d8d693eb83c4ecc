CREATE PROCEDURE APP_SCHEMA.sqlbee_indexes(IN wanted VARCHAR(64))
    SQL SECURITY DEFINER
    COMMENT 'sqlbee: the indexes of one table of this schema, as SHOW INDEX lists them, never its rows'
BEGIN
    SELECT INDEX_NAME AS Key_name, SEQ_IN_INDEX AS Seq_in_index, COLUMN_NAME AS Column_name,
           SUB_PART AS Sub_part, NON_UNIQUE AS Non_unique, INDEX_TYPE AS Index_type
    FROM information_schema.STATISTICS
    WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = wanted;
END
